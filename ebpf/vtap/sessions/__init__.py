"""vTAP sessions: SessionMirror (tc_sessions.py, tc_sessions.bpf.c) copies frames chosen by
ordered rules to interfaces or tunnelled to collectors; config.py reads sessions
(Session, Rule, the TOML file), tables.py builds the classifier's tables, encap.py the
tunnel headers.

Nothing is imported here: import the module you need (or the class from `ebpf`).
"""
