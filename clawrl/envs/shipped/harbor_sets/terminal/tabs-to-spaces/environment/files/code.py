def f():
	return 1


class A:
	def g(self):
		return 2
