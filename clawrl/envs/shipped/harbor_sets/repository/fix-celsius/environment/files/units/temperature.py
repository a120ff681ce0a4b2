def to_fahrenheit(celsius):
    return celsius * 5 / 9 + 32
