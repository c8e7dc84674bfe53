"""Full and hybrid sharding over two network levels: the step and memory per strategy
(predict.py), the flags that describe them (inputs.py), the what-if table (whatif.py)."""
