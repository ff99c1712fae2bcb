"""`python -m socialweb_computer` runs the command-line interface."""

from socialweb_computer.cli.main import main

raise SystemExit(main())
