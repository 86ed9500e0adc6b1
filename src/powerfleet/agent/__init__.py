"""powerfleet.agent"""
