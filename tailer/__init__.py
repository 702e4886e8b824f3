"""Bytes -> lines -> history, live and offline. Rooms by concern (ARCHITECTURE.md maps them):
`inputs` (files to lines and frames), `history` (the store), `alerts` (rules and fates), `outbound` (webhooks,
Alertmanager, remote write), `live` (the sidecar's reading pass), `app` (the CLI and server), `offline` (`mstail parse`);
`config` and `notices` are shared by all of them."""
