"""Leaf modules every other part may import (they import nothing of the project): facts
shared by the ahead-of-time side and the runtime side, such as the delegate blob wire
format, the c10 dtype table and the content-addressed artifact cache."""
