import unittest

from textkit.slug import slugify


class SlugTest(unittest.TestCase):
    def test_lower(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation(self):
        self.assertEqual(slugify("Hi, there!"), "hi-there")

    def test_spaces(self):
        self.assertEqual(slugify("  many   Spaces "), "many-spaces")
