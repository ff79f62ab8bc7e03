from etmetal.scripts.cli import main

raise SystemExit(main())
