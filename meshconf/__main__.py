"""``python -m meshconf``: the same command line as ``meshconf``."""

from meshconf.cli import main

raise SystemExit(main())
