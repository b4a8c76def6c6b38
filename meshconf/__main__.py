from meshconf.cli import main

raise SystemExit(main())
