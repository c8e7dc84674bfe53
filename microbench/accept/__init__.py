"""Reading records: the suite, acceptance rules, compare, the HTML report, JUnit, plots, tables."""
