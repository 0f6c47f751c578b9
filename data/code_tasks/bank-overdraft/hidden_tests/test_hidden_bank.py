from bank import Account, InsufficientFunds, transfer


def test_overdraft_refused():
    a, b = Account("ann", 10), Account("bob", 0)
    try:
        transfer(a, b, 11)
    except InsufficientFunds:
        assert (a.balance, b.balance) == (10, 0)
        return
    raise AssertionError("transfer beyond the balance must raise InsufficientFunds")


def test_transfer():
    a, b = Account("ann", 10), Account("bob", 1)
    transfer(a, b, 10)
    assert (a.balance, b.balance) == (0, 11)


def test_deposit_positive():
    try:
        Account("x").deposit(0)
    except ValueError:
        return
    raise AssertionError("deposit(0) must raise")
