"""Bytes -> lines -> history: follow files, parse and store what they say, run the alert rules, and the
`mstail` command itself (cli, config, serve). ARCHITECTURE.md maps the modules."""
