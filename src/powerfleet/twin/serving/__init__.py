"""powerfleet.twin.serving"""
