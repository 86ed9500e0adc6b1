"""powerfleet.broker"""
