"""tpplan.report"""
