"""Accounts and transfers."""


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError(f"deposit amount must be positive, got {amount}")
        self.balance += amount


def transfer(source, target, amount):
    """Move ``amount`` from source to target; raises InsufficientFunds if source cannot cover it."""
    if amount <= 0:
        raise ValueError(f"transfer amount must be positive, got {amount}")
    source.balance -= amount
    target.balance += amount
