"""Accounting: what work held, used and cost.

- ``ledger``        the usage ledger, priced piecewise
- ``rollups``       the ledger's sums that reports read, per day and per workload and month
- ``volumes``       instance volumes in the ledger (storage per GB-month)
- ``periods``       what the ledger prices, and its days and months
- ``usage``         usage reports from the ledger
- ``usage_workloads`` the rows of a report by workload, from month rows where it can
- ``usage_metrics`` usage as Prometheus metrics, by team and fleet
- ``budgets``       team budgets per month and what exceeding them does
- ``budget_state``  what budgets say now, read by the scheduler's rules
- ``project_budgets`` project budgets per month: they notify
"""
