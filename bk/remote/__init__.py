"""Running commands on other machines: ``bk.remote.ssh`` is the one module
that starts ``ssh`` (bounded output, per-call timeout, cancellable)."""
