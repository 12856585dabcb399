"""Maintainer tools, run from the repository root as `python -m tools.NAME`
(the shell scripts as `bash tools/NAME.sh`). Not part of the wheel."""
