"""Subcommands of the ``optical`` CLI; shared option helpers live in ``_common``."""
