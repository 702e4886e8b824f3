"""Lines -> records: the format engine and the built-in formats (TOML data files in parsers/formats/).

    formats = load_formats()                # --pattern, --formats files, the user folder, then built-ins
    parser = SourceParser(formats)          # one per followed file; auto-detects and locks on a format
    for item in parser.feed(line, line_no, now): ...
"""

from .engine import Item, SourceParser
from .loader import builtin_formats, format_table, load_format_file, load_formats, pattern_format, user_formats_dir
from .schema import Format, FormatError

__all__ = [
    "Format",
    "FormatError",
    "Item",
    "SourceParser",
    "builtin_formats",
    "format_table",
    "load_format_file",
    "load_formats",
    "pattern_format",
    "user_formats_dir",
]
