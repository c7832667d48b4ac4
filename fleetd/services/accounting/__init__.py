"""Accounting: what work held, used and cost.

- ``ledger``        the usage ledger, priced piecewise
- ``usage``         usage reports from the ledger
- ``budgets``       team budgets per month and what exceeding them does
- ``budget_state``  what budgets say now, read by the scheduler's rules
"""
