"""History: the store of every record (SQLite state file, columns in memory), series, folds and the heatmap
served from it, and the state folders on disk."""
