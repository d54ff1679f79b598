from throttledjob.cli import main

raise SystemExit(main())
