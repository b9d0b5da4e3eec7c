"""EC2 provider (boto3); see provider.py."""
