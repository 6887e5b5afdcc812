"""Command line: the parser, the commands, what they print."""
