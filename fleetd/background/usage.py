"""Account the usage ledger up to now, then check the teams' and projects' budgets against it."""

from fleetd.services.accounting import project_budgets
from fleetd.services.accounting.budgets import check_budgets
from fleetd.services.accounting.ledger import flush

NAME = "usage"
DESCRIPTION = (
    "Accounts running and ended runs and instance volumes in the usage ledger, then checks team "
    "and project budgets"
)


def run(rt):
    """One ledger pass and one budget check; returns what each did."""
    return {**flush(rt), **check_budgets(rt), **project_budgets.check_budgets(rt)}
