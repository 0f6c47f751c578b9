from bank import Account


def test_deposit():
    a = Account("ann")
    a.deposit(5)
    assert a.balance == 5
