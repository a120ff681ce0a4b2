import unittest

from units.temperature import to_fahrenheit


class FahrenheitTest(unittest.TestCase):
    def test_boiling(self):
        self.assertAlmostEqual(to_fahrenheit(100), 212)

    def test_body(self):
        self.assertAlmostEqual(to_fahrenheit(37), 98.6)

    def test_minus_forty(self):
        self.assertAlmostEqual(to_fahrenheit(-10), 14)
