"""tpplan.cost"""
