class InvalidInput(ValueError):
    """A client error; the message names the input and the limit it broke.

    Models turn it into an INVALID_ARG response for that request alone.
    """

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
