"""What the hardware should give: facts read from the machine and the formulas over them."""
