"""powerfleet.beat"""
