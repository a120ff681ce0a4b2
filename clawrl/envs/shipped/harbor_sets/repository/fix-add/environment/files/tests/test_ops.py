import unittest

from calc.ops import add


class AddTest(unittest.TestCase):
    def test_small(self):
        self.assertEqual(add(2, 2), 4)

    def test_negative(self):
        self.assertEqual(add(-1, 4), 3)

    def test_floats(self):
        self.assertAlmostEqual(add(0.5, 0.25), 0.75)
