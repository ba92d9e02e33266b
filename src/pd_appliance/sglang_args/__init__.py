"""SGLang's own command-line parser and environment registry as the judges of what we render.

The serving role writes `python -m sglang.launch_server <flags>` into supervisord's conf.d and
`SGLANG_*` env hooks into the programs' environments. A misspelt flag or hook name would only
show on a GPU host, after the checkpoint download, as a crash or (for an env hook) as nothing at
all. So:

- `rendered` reads rendered conf.d files back into the argv SGLang receives;
- `introspect` runs inside a venv holding the real, patched SGLang wheel and asks its parser
  (`sglang.srt.server_args.prepare_server_args`, what `launch_server` calls) and its environment
  registry (`sglang.srt.environ`);
- `real` drives `introspect` from any Python through a subprocess;
- `venv` builds that venv once, cached by its inputs;
- `registry` checks env hook names against the registry file derived from the wheel, with the
  standard library only, so preflight can run it on the controller before any venv exists.

Everything here but `introspect` imports nothing outside the standard library and pd_appliance.
"""
