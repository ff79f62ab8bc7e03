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
        "ExecuTorch's backend conformance suite per flow (portable, etmetal, metal_host, metal_stock, metal_emulated)",
    ),
    "sanitize": (
        "etmetal.scripts.regress_sanitize",
        "the shim, delegate and fuzz tests with the native layer under ASan and UBSan",
    ),
    "metal-check": (
        "etmetal.scripts.regress_metal_check",
        "registry and demo models on mps_emulated under the Metal checker (memcheck, racecheck)",
    ),
}

add_arguments, run = make_command(SUITES)
