"""`python -m server`: the language server on stdin/stdout (`--tcp PORT` for debugging)."""

from server import main

raise SystemExit(main())
