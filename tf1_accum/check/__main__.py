"""``python -m tf1_accum.check PATH...``: the same as the ``tf1-accum-check`` command."""

from __future__ import annotations

from tf1_accum.check._cli import main

raise SystemExit(main())
