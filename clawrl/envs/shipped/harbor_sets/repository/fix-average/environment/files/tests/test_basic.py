import unittest

from stats.basic import average


class AverageTest(unittest.TestCase):
    def test_fraction(self):
        self.assertAlmostEqual(average([1, 2]), 1.5)

    def test_empty(self):
        self.assertEqual(average([]), 0.0)

    def test_floats(self):
        self.assertAlmostEqual(average([0.5, 0.25, 0.75]), 0.5)
