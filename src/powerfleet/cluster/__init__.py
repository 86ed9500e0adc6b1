"""powerfleet.cluster"""
