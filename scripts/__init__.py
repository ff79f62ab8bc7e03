"""The etmetal command line."""
