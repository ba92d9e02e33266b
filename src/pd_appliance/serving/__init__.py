"""Serving: the decisions behind the supervisor programs for prefill, decode and router.

GPU pinning and NUMA binding from the NVML facts (pinning), env-hook merging and supervisor's
quoting rules (supervisor_format), the engine and router command lines (commands), the program
launcher that reads secrets and gates the router on worker health (launch), and the supervisor
extension that restarts exactly the programs whose configuration changed (supervisor_rpc, apply).
"""
