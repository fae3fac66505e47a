from orbitkv.cli import main

raise SystemExit(main())
