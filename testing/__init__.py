"""What tests and users' test suites plug in: pytest plugins (Cortex-M programs run on the
host), ExecuTorch backend-suite flows, and reference helpers for comparing with eager."""
