"""The measuring code of ``etmetal bench``: every suite's arms, checks and numbers.

``etmetal.scripts.bench_*`` only parse arguments, call these modules and print; nothing
here imports ``etmetal.scripts`` (``test/scripts/test_import_direction.py`` checks it).

- :mod:`.timing`: interleaved arms, medians, ratios, machine facts, the JSON document
- :mod:`.delegate`, :mod:`.runtime`, :mod:`.lowering`, :mod:`.overhead`, :mod:`.shims`,
  :mod:`.metal`, :mod:`.llm`, :mod:`.isolation`, :mod:`.imports`: one suite each
- :mod:`.all_suites`: every suite in its own process (``etmetal bench all``)
- :mod:`.report`: BENCHMARKS.md from the suites' JSON
"""
