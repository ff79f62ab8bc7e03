"""``etmetal regress SUITE``: regression matrices against independent references."""

from etmetal.scripts.suites import make_command

SUITES = {
    "view-copy": (
        "etmetal.scripts.regress_view_copy",
        "view_copy lowering: stock config vs etmetal.backend_config() on the stock runtime",
    ),
    "cortex-m": (
        "etmetal.scripts.regress_cortex_m",
        "lower ExecuTorch's Cortex-M model zoo and run it in etmetal's runtime",
    ),
    "backend-suite": (
        "etmetal.scripts.regress_backend_suite",
        "ExecuTorch's backend conformance suite per flow (portable, etmetal, metal_host, metal_stock)",
    ),
}

add_arguments, run = make_command(SUITES)
