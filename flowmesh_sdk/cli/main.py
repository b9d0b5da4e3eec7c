def main() -> None:
    print("todo")
