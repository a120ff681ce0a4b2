import unittest

from mathx.bounds import clamp


class ClampTest(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_below(self):
        self.assertEqual(clamp(-3, 0, 10), 0)

    def test_below_float(self):
        self.assertEqual(clamp(-1.0, 0.0, 1.5), 0.0)
