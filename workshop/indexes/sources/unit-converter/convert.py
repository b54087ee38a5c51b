"""Unit conversion (the example skill index's reusable source): pure arithmetic."""

FACTORS = {("km", "mile"): 1 / 1.609344, ("mile", "km"): 1.609344, ("kg", "lb"): 2.2046226218, ("lb", "kg"): 0.45359237}


def convert(amount: float, unit_from: str, unit_to: str) -> float:
    if (unit_from, unit_to) == ("c", "f"):
        return amount * 9 / 5 + 32
    if (unit_from, unit_to) == ("f", "c"):
        return (amount - 32) * 5 / 9
    return amount * FACTORS[(unit_from, unit_to)]
