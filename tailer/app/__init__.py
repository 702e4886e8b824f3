"""The `mstail` command: the CLI, the server's start-up and shutdown (`serve`), connection limits, the page's URL and
the demo."""
