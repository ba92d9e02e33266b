"""python -m pd_appliance.sglang_args (see pd_appliance.sglang_args.cli)."""

from pd_appliance.sglang_args.cli import main

raise SystemExit(main())
