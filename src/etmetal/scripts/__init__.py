"""The ``etmetal`` command line (``cli``, one module per command) and the drivers behind
``etmetal bench`` and ``etmetal regress``. Nothing here is imported by the library or by
tests other than the CLI's own: a helper that a test, a benchmark and a user could all
want belongs in ``etmetal.examples`` (models), ``etmetal.testing`` (checks against a
reference) or the package that owns the idea, and the driver here only parses arguments,
calls it and prints."""
