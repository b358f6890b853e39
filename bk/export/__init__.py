"""The exports: bookings and their use in the formats a lab already reads.

Three renderers, each a pure function of one typed record (``model.Export``,
assembled by the service's ``export`` row, or by the monitor from what it
holds in memory) and of the time zone where one is shown:

* ``prom``: the Prometheus text exposition format (a node_exporter textfile,
  or a scrape of ``bk export prom --listen``), with the metric table and the
  in-repo lint of Prometheus' naming rules;
* ``ics``: an RFC 5545 calendar feed;
* ``html``: a static, self-contained page of the week.

Nothing here reads a clock, a file or a driver: the data and ``now`` are
arguments, and the output is text (or bytes) for the caller to write.
"""
