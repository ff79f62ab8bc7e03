"""etmetal in ExecuTorch's own C++ runtime: the Python-free runner (:mod:`.runner`)."""
