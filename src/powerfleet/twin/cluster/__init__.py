"""powerfleet.twin.cluster"""
