"""Hard enforcement (issue 31): GPU device access follows the bookings,
through cgroup v2 device programs.  Off unless the administrator turns it
on (``bk admin enforce on``); nothing here is imported by everyday commands.

``kernel`` is the one module that calls ``bpf(2)``; ``cgroups`` reads the
cgroup tree, ``/proc`` and the NVIDIA device numbers; ``state`` is the
enforcer's status and events files; ``daemon`` the loop of
``gpubk-enforcer.service``; ``admin`` the plans of ``bk admin enforce``.
The rule itself (which cgroup may open which GPU, when) is pure:
``bk.core.enforce``, and the programs ``bk.core.devprog``.
"""
