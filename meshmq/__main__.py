"""``python -m meshmq`` runs the same CLI as the ``meshmq`` console script."""

from meshmq.cli import main

raise SystemExit(main())
