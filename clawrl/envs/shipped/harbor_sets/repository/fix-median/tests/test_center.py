import unittest

from stats.center import median


class MedianTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)

    def test_unsorted(self):
        self.assertEqual(median([9, 1, 5]), 5)

    def test_pair(self):
        self.assertEqual(median([10, 0]), 5)
